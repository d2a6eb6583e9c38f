"""The engine behind typed commands and per-turn outputs (`EngineCore`), run in a process of its own for a pod
(`engine.core.process`, driven from the pod's event loop by `engine.core.client.EngineCoreClient`)."""
