"""Embeddings from a real (tiny, sharded) Hugging Face checkpoint and the `pcgtts asg` commands."""

from __future__ import annotations

import json

import pytest
import torch
from pcgtts.asg_tables import ASGTable, build_asg
from pcgtts.asg_tables.embeddings import read_embedding_rows
from transformers import LlamaConfig, LlamaForCausalLM

from pcgtts.cli import main

OFFSET, SPEECH, VOCAB = 200, 64, 300


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 300-token Llama whose speech rows 200..263 come in 8 tight clusters; saved in several shards."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(1)
    centres = torch.randn(8, 32, generator=gen)
    speech = centres.repeat_interleave(8, dim=0) + 0.2 * torch.randn(SPEECH, 32, generator=gen)
    with torch.no_grad():
        model.model.embed_tokens.weight[OFFSET : OFFSET + SPEECH] = speech
    path = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(path, max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").exists()
    return path, model


def test_reads_only_the_requested_rows(checkpoint):
    path, model = checkpoint
    rows, meta = read_embedding_rows(path, OFFSET, SPEECH)
    torch.testing.assert_close(rows, model.model.embed_tokens.weight[OFFSET : OFFSET + SPEECH].detach())
    head, head_meta = read_embedding_rows(path, OFFSET, SPEECH, which="output")
    torch.testing.assert_close(head, model.lm_head.weight[OFFSET : OFFSET + SPEECH].detach())
    assert meta["tensor"] == "model.embed_tokens.weight" and head_meta["tensor"] == "lm_head.weight"
    assert meta["rows_sha256"] != head_meta["rows_sha256"]
    with pytest.raises(ValueError):
        read_embedding_rows(path, 290, 64)


def test_build_and_stats_commands(checkpoint, tmp_path, capsys):
    path, model = checkpoint
    out, plot = tmp_path / "asg.safetensors", tmp_path / "asg.png"
    assert (
        main(
            [
                "asg",
                "build",
                "--model",
                str(path),
                "--theta",
                "0.8",
                "--offset",
                str(OFFSET),
                "--num-tokens",
                str(SPEECH),
                "--out",
                str(out),
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    table = ASGTable.load(out)
    expected = build_asg(
        model.model.embed_tokens.weight[OFFSET : OFFSET + SPEECH].detach(),
        0.8,
        offset=OFFSET,
        vocab_size=VOCAB,
        progress=False,
    )
    assert table.vocab_size == VOCAB and torch.equal(table.group_members, expected.group_members)
    assert table.meta["source"] == path.name and table.meta["theta"] == 0.8
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()

    assert main(["asg", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["speech_range"] == [OFFSET, OFFSET + SPEECH]
    assert stats["num_groups"] == table.num_groups and stats["coverage"] > 0.5
    assert sum(stats["owners_histogram"].values()) == SPEECH
    assert out.with_suffix(".png").exists()


def test_theta_sweep_prints_one_line_per_theta(checkpoint, capsys):
    path, _ = checkpoint
    assert (
        main(
            [
                "asg",
                "build",
                "--model",
                str(path),
                "--theta",
                "0.95",
                "0.8",
                "0.3",
                "--offset",
                str(OFFSET),
                "--num-tokens",
                str(SPEECH),
            ]
        )
        == 0
    )
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [float(line[0]) for line in lines] == [0.95, 0.8, 0.3]
    means = [float(line[1]) for line in lines]
    assert 1 <= means[0] <= means[1] <= means[2] <= SPEECH
