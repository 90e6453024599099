"""`gatelab bench`: where the time of a training step goes, measured side by side in one process.

What it measures, per experiment preset (tiny and tiny-moe by default):
- how many graphs dynamo makes of each variant's compiled block (1: no graph break);
- the step time and tokens/s of `baseline` and one variant of each gate family, as ratios to `baseline`;
- gatelab's real Lightning training step (its Trainer settings, callbacks and MLflow logger) against a plain PyTorch
  loop on the same model, batches, optimizer and precision: the framework overhead as a ratio;
- fp32 against bf16 autocast, and the preset's own precision against a plain fp32 eager loop;
- the model's achieved FLOP/s against this machine's matrix-multiply FLOP/s on the very GEMM shapes the step runs
  (read off a profiler trace of one step), and so the share of step time spent outside those GEMMs;
- peak memory, and the fixed cost of one run (process start and imports, setup, evaluation) against its training time,
  from a real `gatelab train` run in a child process;
- with `--sweep`, a real sweep run with one worker and then two (wall time, fixed-cost share, throughput ratio).

On a CUDA machine it is the GPU check of issue 30, which must end within 8 minutes on one H100 or H200: the options a
user does not give take GPU_DEFAULTS (the small preset, every G1 variant and one of each other gate, shorter
warm-ups), fp32 steps run on a cut batch, the compile-cache runs happen whatever the preset says, and the targets end
with the GPU's own: MFU of the Lightning step, seconds of a run's evaluation, peak GPU memory of a run, and compiling
from the cache (`gpu_figures`, `acceptance_checks`).

The modules: `machine` (the machine and its device), `timing` (interleaved rounds, ratio intervals), `steps` (the
steps timed), `profiling`, `flops` and `gpu_profile` (where a step's time goes), `runs` (real runs in child
processes), `measure` (`bench`, part by part), `checks` (the targets), `render` (bench.md and bench.json), `command`
(what `gatelab bench` does beyond reading its options) and `data` (`gatelab bench --data`).
"""
