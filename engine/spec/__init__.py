"""Speculative decoding: proposers (n-gram prompt lookup, replay), config, and the verification rules."""

from engine.spec.config import SpeculativeConfig, SpeculativeFlags
from engine.spec.proposer import Proposer
from engine.spec.stats import SpecStats

__all__ = ["Proposer", "SpecStats", "SpeculativeConfig", "SpeculativeFlags"]
