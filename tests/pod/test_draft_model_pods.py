"""Draft-model speculation on pods: the decode pod's engine gets the draft from --speculative-config (or
PDSERVE_SPECULATIVE_CONFIG); a prefill pod's engine, which never speculates, drops it and loads no draft."""

from __future__ import annotations

import json

from engine.spec.config import SpeculativeConfig
from pod.config import parse_pod_config
from pod.run import core_spec

DRAFT = {"method": "draft_model", "model": "smollm2-135m", "num_speculative_tokens": 4}


def test_decode_pod_keeps_the_draft_and_prefill_pod_drops_it() -> None:
    argv = ["--speculative-config", json.dumps(DRAFT)]
    decode = core_spec("decode", parse_pod_config("decode", argv, with_receiver=True, environ={}))
    assert decode.engine.speculative_config == SpeculativeConfig.parse(DRAFT)
    from_env = parse_pod_config("decode", [], with_receiver=True, environ={"PDSERVE_SPECULATIVE_CONFIG": argv[1]})
    assert core_spec("decode", from_env).engine.speculative_config == decode.engine.speculative_config
    prefill_config = parse_pod_config("prefill", argv, with_receiver=False, environ={})
    assert prefill_config.engine.speculative_config is not None
    assert core_spec("prefill", prefill_config).engine.speculative_config is None
