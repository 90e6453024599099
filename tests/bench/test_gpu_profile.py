"""gatelab.bench.gpu_profile: kernel groups, busy time and gaps, from kernel names as real CUDA traces show them (eager
torch, cuBLAS/cuBLASLt, flash / memory-efficient / cuDNN attention, inductor), and one real profile on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gatelab.bench.gpu_profile import (
    ATTENTION,
    GEMM,
    KernelInterval,
    busy_union,
    device_work,
    kernel_group,
    kernel_markdown,
    kernel_profile,
    kernel_summary,
    short_kernel_name,
)

GEMM_CUBLAS = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
               "_kernel__5x_cublas")
FLASH_FORWARD = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
                 "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
                 "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
SIGMOID = ("void at::native::vectorized_elementwise_kernel<4, at::native::sigmoid_kernel_cuda("
           "at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#1}::operator()() const::"
           "{lambda(float)#1}, "
           "std::array<char*, 2ul> >(int, at::native::sigmoid_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::"
           "operator()() const::{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)")
MUL = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
       "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >("
       "at::TensorIteratorBase&, "
       "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::"
       "{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, "
       "float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})")
LOG_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
               "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)")
FMHA = "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, " \
       "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)"
MEMCPY = "Memcpy HtoD (Pinned -> Device)"
ELEMENTWISE = "elementwise"
COPIES = "copies and fills"
OPTIMIZER = "AdamW and grad-norm (multi-tensor)"

KERNELS_AND_GROUPS = [
    (GEMM_CUBLAS, GEMM),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", GEMM),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_"
     "tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)", GEMM),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", GEMM),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
     "false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)", GEMM),
    (FLASH_FORWARD, ATTENTION),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, "
     "2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> >, true, false, "
     "false, false, false, false, false>(pytorch_flash::Flash_bwd_params)", ATTENTION),
    (FMHA, ATTENTION),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", ATTENTION),
    ("triton_poi_fused_mul_sigmoid_0", "inductor fused kernels (Triton)"),
    ("triton_red_fused__to_copy_mean_pow_rsqrt_1", "inductor fused kernels (Triton)"),
    ("triton_tem_fused_addmm_0", GEMM),
    (LOG_SOFTMAX, "cross-entropy (softmax, nll)"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>(float*, float*, "
     "float const*, long const*, float const*, bool, long, long, long, long)", "cross-entropy (softmax, nll)"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, true>(int, float, "
     "float const*, float const*, float const*, float*, float*, float*)", "norms (RMSNorm)"),
    ("void at::native::(anonymous namespace)::rms_norm_kernel<c10::BFloat16, float>(long, float, "
     "c10::BFloat16 const*, c10::BFloat16 const*, float*, c10::BFloat16*)", "norms (RMSNorm)"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float*, float*>"
     "(at::native::(anonymous namespace)::TensorListMetadata<4>, ...)", OPTIMIZER),
    ("void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>(float const*, "
     "at::native::TensorListAddresses, int)", OPTIMIZER),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, "
     "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, unsigned "
     "int, float, 4>)", OPTIMIZER),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
     "unsigned int, float, 4>)", "reductions"),
    (MEMCPY, COPIES),
    ("Memset (Device)", COPIES),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, "
     "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
     "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, ...)", COPIES),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", COPIES),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>"
     "(at::cuda::detail::TensorInfo<float, unsigned int>, ...)", COPIES),
    (SIGMOID, ELEMENTWISE),
    (MUL, ELEMENTWISE),
    ("my_custom_kernel_v2", "other"),
]


@pytest.mark.parametrize(("name", "group"), KERNELS_AND_GROUPS, ids=[name[:50] for name, _ in KERNELS_AND_GROUPS])
def test_real_kernel_names_land_in_their_group(name, group):
    assert kernel_group(name) == group


def intervals(*spans: tuple[float, float]) -> list[KernelInterval]:
    return [KernelInterval("k", start, end) for start, end in spans]


@pytest.mark.parametrize(("spans", "union"), [
    ([(0, 10), (5, 15)], [(0, 15)]),  # overlapping: two streams
    ([(0, 10), (2, 3)], [(0, 10)]),  # nested
    ([(0, 10), (10, 12)], [(0, 12)]),  # touching: back to back on one stream
    ([(0, 1), (2, 3)], [(0, 1), (2, 3)]),  # disjoint
    ([(20, 30), (0, 10), (5, 8), (10, 12), (25, 40)], [(0, 12), (20, 40)]),  # all of them, out of order
    ([], []),
])
def test_busy_union_counts_overlapped_time_once(spans, union):
    assert busy_union(intervals(*spans)) == union


def two_steps() -> list[KernelInterval]:
    """Each step: a GEMM, a sigmoid right after it, 3 us of launch latency, flash attention with a copy on another
    stream inside it, 50 us waiting for the host, a second GEMM; step 2 starts 2 us after step 1's last kernel."""
    timeline = []
    for offset in (0, 285):
        timeline += [KernelInterval(GEMM_CUBLAS, offset, offset + 100),
                     KernelInterval(SIGMOID, offset + 100, offset + 110),
                     KernelInterval(FLASH_FORWARD, offset + 113, offset + 213),
                     KernelInterval(MEMCPY, offset + 150, offset + 170),
                     KernelInterval(GEMM_CUBLAS, offset + 263, offset + 283)]
    return timeline


def test_kernel_summary_of_a_known_timeline():
    summary = kernel_summary(two_steps(), steps=2)
    assert summary["window_ms_per_step"] == pytest.approx(0.568 / 2)
    assert summary["busy_ms_per_step"] == pytest.approx(0.460 / 2)  # the copy inside flash attention adds nothing
    assert summary["idle_ms_per_step"] == pytest.approx((3 + 50 + 2 + 3 + 50) / 1e3 / 2)
    assert summary["idle_share"] == pytest.approx(108 / 568)
    rows = {row["kernel"]: row for row in summary["kernels"]}
    assert [row["kernel"] for row in summary["kernels"]] == [
        short_kernel_name(GEMM_CUBLAS), "pytorch_flash::flash_fwd_kernel", MEMCPY,
        "vectorized_elementwise_kernel [sigmoid_kernel_cuda]"]
    assert rows[short_kernel_name(GEMM_CUBLAS)] | {"share": None} == {
        "kernel": short_kernel_name(GEMM_CUBLAS), "group": GEMM, "ms_per_step": pytest.approx(0.12),
        "calls_per_step": pytest.approx(2), "share": None}
    assert rows[MEMCPY]["ms_per_step"] == pytest.approx(0.02) and rows[MEMCPY]["calls_per_step"] == pytest.approx(1)
    assert [row["share"] for row in summary["kernels"]] == pytest.approx([0.48, 0.4, 0.08, 0.04])
    assert {group["group"]: group["ms_per_step"] for group in summary["groups"]} == pytest.approx(
        {GEMM: 0.12, ATTENTION: 0.1, COPIES: 0.02, ELEMENTWISE: 0.01})
    assert [group["group"] for group in summary["groups"]] == [GEMM, ATTENTION, COPIES, ELEMENTWISE]
    assert sum(group["share"] for group in summary["groups"]) == pytest.approx(1)
    gaps = summary["gaps"]
    assert gaps["count_per_step"] == 1  # the two 50 us waits; the 3 us and 2 us gaps are launch latency
    assert gaps["ms_per_step"] == pytest.approx(0.05)
    assert [gap["ms"] for gap in gaps["largest"]] == pytest.approx([0.05, 0.05])
    # the copy started later than flash attention but ended first: the gap comes after flash attention
    assert gaps["largest"][0] | {"ms": None} == {"ms": None, "after": "pytorch_flash::flash_fwd_kernel",
                                                 "before": short_kernel_name(GEMM_CUBLAS)}


def test_a_lower_gap_threshold_counts_the_launch_latency_too():
    assert kernel_summary(two_steps(), steps=2, gap_threshold_us=1)["gaps"]["count_per_step"] == pytest.approx(2.5)


def test_kernel_summary_of_no_kernels_reports_none():
    summary = kernel_summary([], steps=3)
    assert summary["kernels"] == [] and summary["groups"] == [] and summary["gaps"]["largest"] == []
    assert summary["window_ms_per_step"] == summary["busy_ms_per_step"] == summary["idle_share"] == 0
    assert kernel_markdown(summary, "tiny") == ["## tiny", "", "No CUDA kernels were recorded."]


@pytest.mark.parametrize(("name", "short"), [
    (LOG_SOFTMAX, "cunn_SoftMaxForward [LogSoftMaxForwardEpilogue]"),
    (SIGMOID, "vectorized_elementwise_kernel [sigmoid_kernel_cuda]"),
    (MUL, "elementwise_kernel [MulFunctor]"),
    (FLASH_FORWARD, "pytorch_flash::flash_fwd_kernel"),
    (FMHA, "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"),
    ("triton_poi_fused_mul_sigmoid_0", "triton_poi_fused_mul_sigmoid_0"),
    (MEMCPY, MEMCPY),  # its parentheses say which copy it is
])
def test_short_names_drop_template_arguments_and_argument_lists(name, short):
    assert short_kernel_name(name) == short


def test_short_names_fit_a_table_column():
    assert short_kernel_name(GEMM_CUBLAS) == GEMM_CUBLAS[:80]
    for name, _ in KERNELS_AND_GROUPS:
        short = short_kernel_name(name)
        assert len(short) <= 80
        if not name.startswith(("Memcpy", "Memset")):
            assert "<" not in short and "(" not in short and not short.startswith("void ")


def test_kernel_markdown_shows_every_group_and_the_idle_share():
    summary = kernel_summary(two_steps(), steps=2)
    lines = kernel_markdown(summary, "Kernels of a tiny step")
    text = "\n".join(lines)
    assert lines[0] == "## Kernels of a tiny step"
    assert all(f"| {group} |" in text for group in (GEMM, ATTENTION, COPIES, ELEMENTWISE))
    assert "(19.0% of the window" in text  # 108 of 568 us idle
    assert lines[lines.index("| gap (ms) | after | before |") + 2:] == [
        f"| 0.050 | pytorch_flash::flash_fwd_kernel | {short_kernel_name(GEMM_CUBLAS)} |"] * 2


def trace_event(name: str, activity_type: str | None, device_type=torch.autograd.DeviceType.CUDA, device_index=0,
                is_user_annotation=False) -> SimpleNamespace:
    """A FunctionEvent's fields that device_work reads, as torch 2.13's profiler fills them."""
    return SimpleNamespace(name=name, activity_type=activity_type, device_type=device_type, device_index=device_index,
                           is_user_annotation=is_user_annotation, time_range=SimpleNamespace(start=1.0, end=3.0))


def test_device_work_keeps_kernels_copies_and_fills_of_the_device_only():
    events = [trace_event(GEMM_CUBLAS, "kernel"), trace_event(MEMCPY, "gpu_memcpy"),
              trace_event("Memset (Device)", "gpu_memset"),
              trace_event("Optimizer.step#AdamW.step", "gpu_user_annotation", is_user_annotation=True),
              trace_event("Context Sync", "cuda_sync"),
              trace_event("aten::mm", "cpu_op", device_type=torch.autograd.DeviceType.CPU),
              trace_event("cudaLaunchKernel", "cuda_runtime", device_type=torch.autograd.DeviceType.CPU),
              trace_event(SIGMOID, "kernel", device_index=1),
              trace_event(MUL, None), trace_event("my_range", None, is_user_annotation=True)]
    assert device_work(events, device_index=0) == [
        KernelInterval(name, 1.0, 3.0) for name in (GEMM_CUBLAS, MEMCPY, "Memset (Device)", MUL)]


def test_device_work_reads_torch_2_11_s_events_which_have_no_activity_type():
    """torch 2.11's FunctionEvent has no `activity_type` attribute (the GPU check on an H100 with torch 2.11 stopped
    there, issue 41): its kernels count, its user annotations do not."""
    def old_event(name: str, is_user_annotation: bool = False) -> SimpleNamespace:
        event = trace_event(name, None, is_user_annotation=is_user_annotation)
        del event.activity_type
        return event

    events = [old_event(GEMM_CUBLAS), old_event("my_range", is_user_annotation=True)]
    assert device_work(events, device_index=0) == [KernelInterval(GEMM_CUBLAS, 1.0, 3.0)]
    bare = old_event(MUL)
    del bare.is_user_annotation
    assert device_work([bare], device_index=0) == [KernelInterval(MUL, 1.0, 3.0)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where torch sees no CUDA GPU")
def test_kernel_profile_needs_cuda():
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        kernel_profile(lambda: None)


@pytest.mark.gpu
def test_kernel_profile_of_a_real_training_step():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    inputs = torch.randn(64, 256, device="cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(inputs).square().mean().backward()
        optimizer.step()

    summary = kernel_profile(step, steps=2)
    groups = {group["group"] for group in summary["groups"]}
    assert summary["kernels"] and GEMM in groups and "AdamW and grad-norm (multi-tensor)" in groups
    assert 0 <= summary["idle_share"] < 1
    assert 0 < summary["busy_ms_per_step"] <= summary["window_ms_per_step"]
    # optimizer.step's record_function range also shows on the GPU timeline (gpu_user_annotation): not a kernel
    assert not any(row["kernel"].startswith("Optimizer.") for row in summary["kernels"])
    assert all(row["calls_per_step"] >= 1 for row in summary["kernels"])


def test_the_lightning_callback_profiles_the_steps_it_names_in_a_real_fit(tmp_path, monkeypatch):
    """On a CPU, with CUDA's calls stood in for: the profiler starts at step `first`, stops where step
    `first + steps` starts, and the summary covers `steps` steps (no CUDA kernels here: zero of them)."""
    import lightning as L

    from gatelab.bench import gpu_profile, steps
    from gatelab.data.resolve import load_experiment
    from tests.helpers import write_micro_experiment

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    started_at, stopped_at = [], []
    real_start, real_stop = torch.profiler.profile.start, torch.profiler.profile.stop
    steps_seen = []

    class Steps(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            steps_seen.append(batch_idx)

    monkeypatch.setattr(torch.profiler.profile, "start", lambda self: started_at.append(steps_seen[-1]) or
                        real_start(self))
    monkeypatch.setattr(torch.profiler.profile, "stop", lambda self: stopped_at.append(steps_seen[-1]) or
                        real_stop(self))
    experiment = load_experiment(write_micro_experiment(tmp_path))
    kernels = gpu_profile.lightning_kernel_profile(first=2, steps=3)
    steps.lightning_steps(experiment, "32-true", 7, tmp_path, callbacks=[Steps(), kernels])
    assert (started_at, stopped_at) == ([2], [5])
    assert kernels.summary["steps"] == 3 and kernels.summary["kernels"] == []
