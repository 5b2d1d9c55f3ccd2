"""One definition per configuration default: the server's settings, the service's and the engine's agree."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest
from pcgtts.engine import EngineConfig
from pcgtts.server.settings import ServerSettings
from pcgtts.server.state import tts_config
from pcgtts.tts import TTSConfig


def defaults(cls) -> dict:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def test_shared_options_have_one_default():
    server, service, engine = defaults(ServerSettings), defaults(TTSConfig), defaults(EngineConfig)
    # the service's rule is not the engine's; nor its speculation policy (a bare Engine speculates on every
    # step, as benchmarks of the rules expect; the service lets the load decide)
    engine_shared = service.keys() & engine.keys() - {"acceptance", "speculation"}
    assert {"device", "num_speculative_tokens", "kv_budget_tokens", "max_num_seqs",
            "max_waiting"} <= engine_shared
    assert {name: service[name] for name in engine_shared} == {name: engine[name] for name in engine_shared}
    # the server's speculation_lengths is the comma-separated text the service's tuple is read from (below)
    server_shared = server.keys() & service.keys() - {"speculation_lengths"}
    assert {"max_waiting", "max_tokens", "decode_threads", "acceptance"} <= server_shared
    assert {name: server[name] for name in server_shared} == {name: service[name] for name in server_shared}


def test_every_shared_setting_reaches_the_service():
    settings = ServerSettings(max_waiting=7, max_num_seqs=3, max_tokens=55, decode_threads=2,
                              acceptance="exact", extra_asg_tables="wide=w.safetensors")
    config = tts_config(settings)
    assert (config.max_waiting, config.max_num_seqs, config.max_tokens, config.decode_threads,
            config.acceptance) == (7, 3, 55, 2, "exact")
    assert config.extra_asg_tables == settings.extra_asg_table_paths


def test_speculation_lengths_are_read_from_the_servers_text():
    assert tts_config(ServerSettings()).speculation_lengths == TTSConfig.speculation_lengths
    assert tts_config(ServerSettings(speculation_lengths="5")).speculation_lengths == (5,)
    assert tts_config(ServerSettings(speculation_lengths=" 4, 6 ")).speculation_lengths == (4, 6)
    assert tts_config(ServerSettings(speculation_lengths="")).speculation_lengths == ()
    with pytest.raises(ValueError, match="comma-separated integers"):
        tts_config(ServerSettings(speculation_lengths="five"))
