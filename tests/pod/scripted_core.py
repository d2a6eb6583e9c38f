"""An engine core played by the test: what a pod's front needs of an EngineCoreClient, with the commands it was sent
recorded and its outputs fed by the test (`on_outputs`)."""

from __future__ import annotations

from collections.abc import Callable

from engine.config import SchedulerConfig
from engine.core.client import EngineDeadError
from engine.core.commands import Command
from engine.core.messages import CoreReady
from engine.core.outputs import CoreOutputs, EngineLoad
from engine.runtime_info import RuntimeInfo
from kv_transfer.layout import KVLayout

INFO = RuntimeInfo("m", "cpu", "float32", 64, 16, 512, 512, (0,))
LAYOUT = KVLayout("float32", 16, 2, 2, 8)


def core_ready(kv_endpoint: str = "") -> CoreReady:
    """A core of INFO's engine with a KV end of LAYOUT, every one of its 64 blocks free."""
    return CoreReady(INFO, SchedulerConfig(), kv_endpoint, LAYOUT, EngineLoad(num_total_blocks=64))


class ScriptedCore:
    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.failed = False
        self.on_outputs: Callable[[CoreOutputs], None] = lambda out: None

    def attach(self, on_outputs: Callable[[CoreOutputs], None], on_dead: Callable[[EngineDeadError], None]) -> None:
        self.on_outputs = on_outputs

    def send(self, command: Command) -> None:
        self.commands.append(command)
