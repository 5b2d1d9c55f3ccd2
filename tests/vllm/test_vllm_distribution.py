"""Through vLLM's CPU build with the plugin: PCG's emitted groups follow the target's coarse distribution
Q_c, and `exact` (vLLM's own sampler, with the plugin's CPU expand fix) keeps the target's token
distribution, at temperature > 0 and with top-p.

One offline vLLM LLM (tiny random target, 1-layer draft, γ=2) serves both: PCG is the deployment's rule and
`exact` requests pick theirs through SamplingParams.extra_args (the per-request choice). Each request
generates two tokens after a fixed prompt: x1 from the prefill (a plain target sample) and x2 verified
against the draft's proposals. The reference joint P(x1, x2) comes from transformers' model and warpers,
independently of vLLM; the ASG table is a partition, so the group of x2 is determined by x2."""

from __future__ import annotations

import pytest
import torch
from engine_support import hf_model, save_draft_from, save_tiny_llama
from stats_support import chi2_pvalue
from vllm_support import TINY, offline_llm, require_vllm, shutdown, spec_counters

V = 16
PROMPT = [1, 2, 3, 4]
GROUPS = [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10], [11, 12, 13]]  # 14, 15 singletons
N = 4000
ALPHA = 1e-4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_vllm()
    from pcgtts.asg_tables import ASGTable

    root = tmp_path_factory.mktemp("vllm-dist")
    target = save_tiny_llama(root / "target", vocab=V, layers=2, seed=21, init_std=0.3, **TINY)
    draft = save_draft_from(target, root / "draft", layers=1, noise=0.3)
    table = ASGTable.from_groups(GROUPS, V)
    table.save(root / "groups.safetensors")
    llm = offline_llm(target, draft, 2, {"acceptance": "pcg", "asg_table": str(root / "groups.safetensors")},
                      max_num_seqs=256)
    yield llm, target, table
    shutdown(llm)


def reference_joint(target, temperature: float, top_p: float) -> torch.Tensor:
    """P(x1, x2) [V, V] of the warped target (transformers)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    hf = hf_model(target)

    def probs(tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor([tokens])
        with torch.no_grad():
            scores = TemperatureLogitsWarper(temperature)(ids, hf(ids).logits[:, -1].float())
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(ids, scores)
        return torch.softmax(scores, -1)[0].double()

    p1 = probs(PROMPT)
    joint = torch.stack([p1[x] * probs(PROMPT + [x]) for x in range(V)])
    return joint / joint.sum()  # float32 softmaxes: sums off by ~1e-7


def sample_pairs(llm, temperature: float, top_p: float, acceptance: str | None) -> tuple[torch.Tensor, dict]:
    """-> (Long[N, 2] generated pairs, vLLM's spec-decode counters over these requests)."""
    from pcgtts.engine.vllm.settings import request_extra_args
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=2, ignore_eos=True,
                            detokenize=False, extra_args=request_extra_args(acceptance, None))
    before = spec_counters(llm)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)] * N, params, use_tqdm=False)
    after = spec_counters(llm)
    pairs = torch.tensor([list(o.outputs[0].token_ids) for o in outputs])
    return pairs, {k: after[k] - before.get(k, 0) for k in after}


def accepted_share(counters: dict) -> float:
    return counters["num_accepted_tokens"] / counters["num_draft_tokens"]


@pytest.mark.parametrize("temperature,top_p", [(0.9, 1.0), (1.3, 0.8)])
def test_pcg_through_vllm_emits_the_targets_coarse_distribution(served, temperature, top_p):
    llm, target, table = served
    pairs, counters = sample_pairs(llm, temperature, top_p, None)
    assert pairs.shape == (N, 2)
    group_of = torch.tensor([int(table.groups_of(t)[0]) for t in range(V)])  # a partition: one group each
    joint = reference_joint(target, temperature, top_p)  # [V, V]
    coarse = torch.zeros(V, table.num_groups, dtype=torch.float64).index_add_(1, group_of, joint)  # [V, M]
    cells = pairs[:, 0] * table.num_groups + group_of[pairs[:, 1]]
    assert chi2_pvalue(cells, coarse.flatten()) > ALPHA
    assert 0.1 < accepted_share(counters) < 0.98, counters  # rejections happened and were resampled


@pytest.mark.parametrize("temperature,top_p", [(0.9, 1.0), (1.3, 0.8)])
def test_exact_through_vllm_keeps_the_targets_token_distribution(served, temperature, top_p):
    llm, target, _ = served
    pairs, counters = sample_pairs(llm, temperature, top_p, "exact")
    joint = reference_joint(target, temperature, top_p)
    assert chi2_pvalue(pairs[:, 0] * V + pairs[:, 1], joint.flatten()) > ALPHA
    assert 0.1 < accepted_share(counters) < 0.98, counters


def test_pcg_accepts_more_than_exact_on_the_same_requests(served):
    """Groups accept what tokens reject: over the same prompts, PCG's share of accepted drafts is higher."""
    llm, _, _ = served
    _, pcg = sample_pairs(llm, 0.9, 1.0, None)
    _, exact = sample_pairs(llm, 0.9, 1.0, "exact")
    assert accepted_share(pcg) > accepted_share(exact) + 0.02, (pcg, exact)
