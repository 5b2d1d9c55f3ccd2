"""The `vllm.general_plugins` entry point (pyproject: pcgtts = "pcgtts.engine.vllm.plugin:register").

vLLM calls `register()` in every process it starts (front end, engine core, workers) before it builds a model
runner. It
  1. refuses a vLLM release it is not written against (versions.py), so the process fails at start-up with
     a message instead of verifying with half-applied patches;
  2. mends the CPU build's expand-kernel fallback (cpu_fix.py) and logs that it did;
  3. wraps vLLM's module-level `rejection_sample` (vllm/v1/sample/rejection_sampler.py; the sampler's
     `forward` looks it up at each call) so that rows whose rule is ours verify through verify.py;
  4. keeps deployments with pcgtts settings on vLLM's V1 model runner (the one it patches), and wraps that
     runner's constructor, which builds the worker's `FlatVerifier` from the deployment's
     `additional_config["pcgtts"]` (nothing happens without it: plain vLLM deployments are untouched), and
     its sampling step, which reads each running request's choice from `SamplingParams.extra_args` (vLLM
     hands the sampler no per-request fields of its own; custom logits processors, the usual carrier, are
     refused under speculative decoding).
Idempotent: vLLM may load plugins more than once in a process.
"""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.pcgtts")  # a child of vLLM's logger: its handlers, its format
ACTIVE = None  # this process's FlatVerifier, once a model runner with pcgtts settings exists


def register() -> None:
    from pcgtts.engine.vllm import cpu_fix
    from pcgtts.engine.vllm.versions import check_vllm

    dist, version = check_vllm()
    cpu_fix.install()
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.worker import gpu_model_runner

    if getattr(rejection_sampler.rejection_sample, "_pcgtts", False):
        return
    standard = rejection_sampler.rejection_sample

    def rejection_sample(*args, **kwargs):
        if ACTIVE is None:
            return standard(*args, **kwargs)
        return ACTIVE.sample(standard, *args, **kwargs)

    rejection_sample._pcgtts = True
    rejection_sampler.rejection_sample = rejection_sample

    runner = gpu_model_runner.GPUModelRunner  # the CPU model runner subclasses it
    init, sample_step = runner.__init__, runner._sample

    def __init__(self, vllm_config, device, *args, **kwargs):
        init(self, vllm_config, device, *args, **kwargs)
        activate(vllm_config, device)

    def _sample(self, logits, spec_decode_metadata):
        if ACTIVE is not None and spec_decode_metadata is not None:
            ACTIVE.row_choices = [_choice(self.requests.get(rid)) for rid in self.input_batch.req_ids]
        return sample_step(self, logits, spec_decode_metadata)

    runner.__init__, runner._sample = __init__, _sample
    _keep_v1_runner()
    log.debug("pcgtts vLLM plugin registered on %s %s", dist, version)


def _keep_v1_runner() -> None:
    """Deployments with pcgtts settings run vLLM's V1 model runner, the one patched above (the CPU build's,
    and CUDA's unless vLLM picks its V2 runner, whose sampler is another class); others choose as vLLM
    does."""
    from pcgtts.engine.vllm.settings import KEY
    from vllm.config.vllm import VllmConfig

    choose = VllmConfig.use_v2_model_runner.fget

    def use_v2_model_runner(self) -> bool:
        if KEY in (self.additional_config or {}):
            return False
        return choose(self)

    VllmConfig.use_v2_model_runner = property(use_v2_model_runner)


def _choice(state) -> tuple[str | None, str | None]:
    from pcgtts.engine.vllm.settings import request_choice

    params = getattr(state, "sampling_params", None)
    return request_choice(getattr(params, "extra_args", None))


def activate(vllm_config, device) -> None:
    """Build this worker's verifier from the deployment's settings (none: vLLM's own verification)."""
    global ACTIVE
    from pcgtts.engine.vllm.settings import STANDARD, VerifySettings
    from pcgtts.engine.vllm.verify import FlatVerifier

    settings = VerifySettings.from_additional_config(vllm_config.additional_config)
    spec = vllm_config.speculative_config
    if settings is None or spec is None:
        return
    if spec.draft_sample_method != "probabilistic" or spec.rejection_sample_method != "standard":
        raise ValueError("pcgtts' acceptance rules need speculative_config draft_sample_method="
                         "'probabilistic' and rejection_sample_method='standard' (got "
                         f"{spec.draft_sample_method!r}, {spec.rejection_sample_method!r})")
    ACTIVE = FlatVerifier(settings, device)
    log.info("pcgtts: vLLM verifies with %r by default (standard sampler for %r); ASG tables %s on %s",
             settings.acceptance, STANDARD, sorted(settings.table_files()) or "none", device)
