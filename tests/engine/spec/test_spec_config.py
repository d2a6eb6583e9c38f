"""SpeculativeConfig from a dict, JSON, the pods' flag and its variable; errors name the field."""

from __future__ import annotations

import pytest

from common.errors import InvalidArgumentError
from engine.spec.config import SpeculativeConfig
from pod.config import parse_pod_config


def test_parse_dict_json_and_off() -> None:
    expected = SpeculativeConfig("ngram", 3, 5, 2)
    fields = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    assert SpeculativeConfig.parse(fields) == expected
    assert SpeculativeConfig.parse('{"num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 2}') == (
        expected
    )
    assert SpeculativeConfig.parse(None) is None and SpeculativeConfig.parse("") is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens: must be > 0, got 0"),
        (
            {"method": "eagle"},
            "speculative_config.method: must be one of ('ngram', 'replay', 'draft_model', 'draft_replay'), got 'eagle'",
        ),
        ({"prompt_lookup_max": "4"}, "speculative_config.prompt_lookup_max: must be a int, got '4'"),
        ({"k": 4}, "speculative_config.k: unknown field"),
        ("{oops", "speculative_config: not valid JSON"),
    ],
)
def test_bad_values_name_the_field(value: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SpeculativeConfig.parse(value)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


def test_pod_flag_and_variable() -> None:
    config = parse_pod_config("decode", ["--speculative-config", '{"num_speculative_tokens": 2}'], True, {})
    assert config.engine.speculative_config == SpeculativeConfig(num_speculative_tokens=2)
    from_env = parse_pod_config("decode", [], True, {"PDSERVE_SPECULATIVE_CONFIG": '{"method": "replay"}'})
    assert from_env.engine.speculative_config == SpeculativeConfig(method="replay")
    assert parse_pod_config("decode", [], True, {}).engine.speculative_config is None
