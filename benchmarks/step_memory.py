"""Where an upslope GRPO step's memory goes: RSS at the end of each stage (collect, prepare,
update, weight sync) and the peak within it, sampled every 5 ms, plus each stage's seconds.

The GRPO benchmark's shape by default (8 prompts x 4 completions x 32 new tokens, lr 1e-5,
no reference model); any upslope override can follow, e.g. to see a setting's effect:

    python benchmarks/step_memory.py --steps 6
    python benchmarks/step_memory.py train.skip_zero_advantage=false train.grad_checkpointing=false
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import threading
import time

GIB = 2**30
SHAPE = ["rollout.prompts_per_step=8", "rollout.n=4", "rollout.max_new_tokens=32", "rollout.temperature=1.0",
         "optim.lr=1e-5", "algo.kl_coef=0", "train.eval_before=false", "train.eval_after=false",
         "log.progress=false", "log.plot=false", "log.tensorboard=false"]


class StagePeaks(threading.Thread):
    """Samples this process's RSS and keeps the peak of the stage currently named."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process()
        self.stage = "start"
        self.peaks: dict[str, int] = {}

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def run(self) -> None:
        while True:
            r, s = self.rss(), self.stage
            self.peaks[s] = max(self.peaks.get(s, 0), r)
            time.sleep(0.005)

    def end(self, next_stage: str) -> tuple[float, float]:
        """(RSS now, peak during the stage) in GiB; starts `next_stage`."""
        time.sleep(0.02)
        now, peak = self.rss(), max(self.peaks.get(self.stage, 0), self.rss())
        self.stage = next_stage
        return now / GIB, peak / GIB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("overrides", nargs="*", help="upslope key=value overrides")
    a = ap.parse_args()
    probe = StagePeaks()
    probe.start()
    from upslope.config import load_config
    from upslope.train.trainers.rl import Trainer

    cfg = load_config(None, [f"run_dir={tempfile.mkdtemp(prefix='step-memory-')}", *SHAPE,
                             f"train.steps={a.steps}", *a.overrides])
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    now, peak = probe.end("collect")
    print(f"{'start (learner + engine up)':30} {time.perf_counter() - t0:6.2f} s  end {now:.2f} GiB  peak {peak:.2f} GiB")
    for step in range(1, a.steps + 1):
        rows = []
        t = time.perf_counter()
        batch, metrics = trainer.collect_batch(step)
        rows.append(("collect", time.perf_counter() - t, *probe.end("prepare")))
        t = time.perf_counter()
        batch = trainer.prepare(batch, metrics)
        rows.append(("prepare", time.perf_counter() - t, *probe.end("update")))
        t = time.perf_counter()
        m = trainer.updater.update(batch, step, trainer.objective)
        rows.append(("update", time.perf_counter() - t, *probe.end("sync")))
        t = time.perf_counter()
        trainer.push_weights()
        rows.append(("sync", time.perf_counter() - t, *probe.end("collect")))
        skipped = m.get("learner/rows_skipped_frac")
        print(f"step {step}: reward {metrics.get('reward/mean', 0):.2f}, forwarded {m.get('learner/tokens', 0):.0f} "
              f"tokens" + (f", rows skipped {skipped:.2f}" if skipped is not None else ""))
        for name, secs, now, peak in rows:
            print(f"  {name:28} {secs:6.2f} s  end {now:.2f} GiB  peak {peak:.2f} GiB")
    trainer.close()
    print(f"process peak (kernel high-water mark): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
