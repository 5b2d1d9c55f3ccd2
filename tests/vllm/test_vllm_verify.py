"""The plugin's verify over vLLM's flattened layout gives our engine's PCG verdicts on the same inputs and
uniforms: for every row it serves, the accepted prefix and the recovered token are those of
`PCGRule.verify` (torch forms) on the row's own tensors with the row's generator, and a fully accepted row
ends with vLLM's bonus token. Rows vLLM keeps (greedy,
`exact`) are left as vLLM's sampler wrote them; a row with no drafts emits its bonus token alone.

No vLLM process here: `FlatVerifier.sample` is called as vLLM's rejection sampler calls it, with a stand-in
for vLLM's own sampler that marks the rows it wrote (vLLM's real sampler and metadata run in
test_vllm_distribution.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from pcgtts.asg_tables import build_asg
from pcgtts.engine.acceptance.pcg import PCGRule
from pcgtts.engine.ops import TORCH_OPS
from pcgtts.engine.vllm.settings import VerifySettings
from pcgtts.engine.vllm.verify import PLACEHOLDER, FlatVerifier

V, SPEC = 48, 3
COUNTS = [3, 3, 2, 0, 3, 1, 3, 2]  # drafts per request this step (vLLM may schedule fewer than γ)
GREEDY, EXACT = 6, 7  # rows vLLM's own sampler keeps: temperature 0, and a request that chose `exact`
VLLM_MARK = 99


@dataclass
class StepMetadata:
    """The fields of vLLM's SamplingMetadata that the verifier reads."""

    temperature: torch.Tensor
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    all_greedy: bool = False
    all_random: bool = False


def vllm_standard(draft_token_ids, num_draft_tokens, max_spec_len, *args, **kwargs) -> torch.Tensor:
    return torch.full((len(num_draft_tokens), max_spec_len + 1), VLLM_MARK, dtype=torch.int32)


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    embeddings = torch.from_numpy(np.random.default_rng(3).normal(size=(V, 6))).float()
    table = build_asg(embeddings, 0.55)
    assert (table.group_sizes() > 1).sum() > 5, "the test needs real, overlapping groups"
    path = tmp_path_factory.mktemp("asg") / "groups.safetensors"
    table.save(path)
    return path


def flat_step(seed: int):
    """One step's inputs in vLLM's layout, and each row's target distribution after its last draft."""
    rng = np.random.default_rng(seed)
    n = sum(COUNTS)
    draft_probs = torch.from_numpy(rng.dirichlet(np.full(V, 0.3), size=n)).float()  # [N, V]
    # targets near the drafts (so some rows accept everything) or far from them
    noise = torch.from_numpy(rng.normal(scale=1.5, size=(n, V))).float()
    target_logits = (draft_probs.log() + noise).contiguous()  # [N, V]
    draft_token_ids = torch.multinomial(draft_probs, 1, generator=torch.Generator().manual_seed(seed))
    bonus_probs = torch.from_numpy(rng.dirichlet(np.full(V, 0.3), size=len(COUNTS))).float()  # [B, V]
    bonus = torch.multinomial(bonus_probs, 1, generator=torch.Generator().manual_seed(seed + 1))  # [B, 1]
    return (draft_token_ids.view(-1).int(), torch.tensor(np.cumsum(COUNTS), dtype=torch.int32), draft_probs,
            target_logits, bonus, bonus_probs)


@pytest.mark.parametrize("residual", ["enumerate", "thinning"])
def test_plugin_verdicts_equal_our_engines_pcg(table_file, residual):
    settings = VerifySettings(acceptance="pcg", asg_table=str(table_file),
                              acceptance_params={"residual": residual})
    verifier = FlatVerifier(settings, "cpu")
    reference = PCGRule(str(table_file), residual=residual, ops=TORCH_OPS)
    outcomes = {"rejected": 0, "all accepted": 0}
    for seed in range(12):
        drafts, cu, p, logits, bonus, bonus_probs = flat_step(seed)
        temperature = torch.ones(len(COUNTS))
        temperature[GREEDY] = 0.0
        seeds = [1000 * seed + b for b in range(len(COUNTS))]
        generators = {b: torch.Generator().manual_seed(s) for b, s in enumerate(seeds)}
        metadata = StepMetadata(temperature, generators)
        verifier.row_choices = [("exact", None) if b == EXACT else (None, None) for b in range(len(COUNTS))]
        out = verifier.sample(vllm_standard, drafts, COUNTS, SPEC, cu, p, logits.clone(), bonus, metadata)
        assert out.shape == (len(COUNTS), SPEC + 1) and out.dtype == torch.int32
        assert (out[GREEDY] == VLLM_MARK).all() and (out[EXACT] == VLLM_MARK).all()
        starts = np.cumsum([0] + COUNTS)
        for b, n in enumerate(COUNTS):
            if b in (GREEDY, EXACT):
                continue
            row = out[b].tolist()
            if n == 0:
                assert row == [int(bonus[b])] + [PLACEHOLDER] * SPEC
                continue
            s = slice(starts[b], starts[b] + n)
            # our engine's inputs for this row: q at the drafts, then its real next distribution
            target = torch.cat([logits[s].softmax(-1), bonus_probs[b:b + 1]])[None]  # [1, n+1, V]
            gen = torch.Generator().manual_seed(seeds[b])
            verdict = reference.verify(drafts[s].long()[None], p[s][None], target, gen)
            k = int(verdict.num_accepted)
            expected = verdict.tokens[0, :k + 1].tolist()
            if k == n:  # all accepted: the bonus token is vLLM's draw
                expected[-1] = int(bonus[b])
                outcomes["all accepted"] += 1
            else:
                outcomes["rejected"] += 1
            assert row == expected + [PLACEHOLDER] * (SPEC - k), f"row {b} of step {seed}"
    assert min(outcomes.values()) >= 5, outcomes


def test_steps_without_our_rows_are_vllms(table_file):
    """All greedy, or every row on `exact`: vLLM's sampler alone."""
    verifier = FlatVerifier(VerifySettings(acceptance="pcg", asg_table=str(table_file)), "cpu")
    drafts, cu, p, logits, bonus, _ = flat_step(0)

    def step(metadata):
        return verifier.sample(vllm_standard, drafts, COUNTS, SPEC, cu, p, logits, bonus, metadata)

    assert (step(StepMetadata(torch.zeros(len(COUNTS)), all_greedy=True)) == VLLM_MARK).all()
    verifier.row_choices = [("exact", None)] * len(COUNTS)
    assert (step(StepMetadata(torch.ones(len(COUNTS)), all_random=True)) == VLLM_MARK).all()
    assert verifier.row_choices is None, "a step's choices are used once"


def test_choices_vllm_cannot_serve(table_file):
    """Refused by `check` (the front end calls it before a request reaches vLLM); one that slips through
    anyway verifies with vLLM's sampler instead of failing the step of every request."""
    verifier = FlatVerifier(VerifySettings(acceptance="pcg", asg_table=str(table_file)), "cpu")
    verifier.check("exact", None)
    verifier.check(None, table_file.stem)
    with pytest.raises(ValueError, match="does not run inside vLLM"):
        verifier.check("lantern", None)
    with pytest.raises(ValueError, match="no ASG table named"):
        verifier.check("pcg", "other")
    assert verifier.rule_for(("lantern", None)) is None and verifier.rule_for(("pcg", "other")) is None
    assert isinstance(verifier.rule_for((None, None)), PCGRule)
