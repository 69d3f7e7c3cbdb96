"""`upslope randopt`: gradient-free search in weight space (RandOpt's Gaussian perturbations,
folded into one model by evolution strategies or CoRP). Each step draws its prompts once; for each of
`randopt.population` perturbations theta + sigma d_k it pushes the perturbed weights into the rollout
engine (in place, one tensor at a time, the noise regenerated from seeds), rolls out and scores the same
prompts with the same sampling seed; `randopt.consolidate` turns the rewards into one update, which a
held-out gate may veto (`randopt.gate_prompts`); the update is applied to the policy in place and the
policy is pushed back, so the engine holds the policy's weights after every step."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from upslope.config import Config
from upslope.errors import ConfigError
from upslope.registry import CONSOLIDATORS
from upslope.seeding import seed_step, step_seed
from upslope.train.collect import Collected, Rounds, collect, on_engine
from upslope.train.loop import BaseTrainer
from upslope.train.methods.perturb import WeightNoise
from upslope.train.sources import step_sampling


def directions(population: int, antithetic: bool) -> list[tuple[int, float]]:
    """(noise direction, sign) of each perturbation: mirrored pairs (j, +1), (j, -1) with `antithetic`."""
    if antithetic:
        return [(k // 2, 1.0 if k % 2 == 0 else -1.0) for k in range(population)]
    return [(k, 1.0) for k in range(population)]


def direction_coefficients(coef: torch.Tensor, dirs: Sequence[tuple[int, float]]) -> dict[int, float]:
    """The update's coefficient on each noise direction: the perturbations' coefficients, signed, summed
    per direction (a mirrored pair's two coefficients meet on one direction)."""
    out: dict[int, float] = {}
    for c, (j, sign) in zip(coef.tolist(), dirs):
        out[j] = out.get(j, 0.0) + sign * c
    return out


def per_prompt_means(rewards: torch.Tensor, group_ids: torch.Tensor, groups: int) -> torch.Tensor:
    """Mean reward of each prompt group 0..groups-1 over its rows."""
    sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, group_ids, rewards.double())
    counts = torch.zeros(groups, dtype=torch.float64).index_add_(0, group_ids, torch.ones_like(rewards, dtype=torch.float64))
    return sums / counts.clamp(min=1)


def check_config(cfg: Config) -> None:
    """Reject what `upslope randopt` cannot run (one ConfigError line), before any model loads."""
    r = cfg.randopt
    if r.antithetic and r.population % 2:
        raise ConfigError(f"randopt.population={r.population}: antithetic pairs need an even population "
                          f"(or randopt.antithetic=false)")
    if cfg.lora.enabled:
        raise ConfigError("lora.enabled=true: upslope randopt perturbs the full weights; LoRA is not supported")
    if cfg.dist.learner_procs > 1 or cfg.dist.rollout_workers:
        raise ConfigError("upslope randopt runs in one process with the in-process engine; set "
                          "dist.learner_procs=1 and dist.rollout_workers=0")
    CONSOLIDATORS.bind(r.consolidate.name, r.consolidate.options, where="randopt.consolidate.options")


class RandOptTrainer(BaseTrainer):
    """Steps of perturb -> roll out -> score (x population) -> consolidate -> (gate) -> update -> sync."""

    def check_config(self) -> None:
        check_config(self.cfg)

    def setup(self) -> None:
        r = self.cfg.randopt
        self.setup_task()
        self.consolidate = CONSOLIDATORS.bind(r.consolidate.name, r.consolidate.options,
                                              where="randopt.consolidate.options")
        self.dirs = directions(r.population, r.antithetic)

    def setup_objective(self) -> None:
        """No gradients: the policy only moves by `WeightNoise.apply_`."""
        self.updater.model.requires_grad_(False)
        self.noise = WeightNoise(self.updater.model, self.cfg.train.seed)

    def score(self, step: int, indices: list[int], round_: int) -> tuple[torch.Tensor, Collected]:
        """Roll out the engine's current weights on `indices` (sampling seed of (step, round_)) and
        score them: each prompt's mean reward, and what was collected."""
        params = step_sampling(self.cfg, self.runtime.stop_ids, step)
        params = replace(params, seed=params.seed + round_)
        got = collect(self.task, on_engine(self.runtime.engine, self.rollout, self.task.pad_id), lambda _: indices,
                      params, Rounds(want=len(indices), reseed=step_seed(self.cfg.train.seed, step)), clock=self.clock)
        return per_prompt_means(got.seen.rewards, got.seen.group_ids, len(indices)), got

    def step(self, step: int) -> dict[str, Any]:
        cfg, r = self.cfg, self.cfg.randopt
        seed_step(cfg.train.seed, step)
        prompts = self.sampler.next(cfg.rollout.prompts_per_step)
        gate = self.sampler.next(r.gate_prompts) if r.gate_prompts else []
        engine = self.runtime.engine  # holds the policy's weights here (after the last step's sync)
        base_gate = self.score(step, gate, 1)[0].mean() if gate else None
        rewards, collected = [], []
        for j, sign in self.dirs:
            with self.clock("sync"):
                engine.update_weights(self.noise.moved(step, {j: sign * r.sigma}))
            per_prompt, got = self.score(step, prompts, 0)
            rewards.append(per_prompt)
            collected.append(got)
        table = torch.stack(rewards)  # [population, prompts]
        with self.clock("learner"):
            coef, metrics = self.consolidate(table, r.sigma)
            coefs = direction_coefficients(coef, self.dirs)
        metrics.update(self.population_metrics(table, collected))
        accepted = True
        if gate:
            with self.clock("sync"):
                engine.update_weights(self.noise.moved(step, coefs))
            candidate = self.score(step, gate, 1)[0].mean()
            accepted = bool(candidate >= base_gate - r.gate_tolerance)
            metrics.update({"randopt/gate_base": float(base_gate), "randopt/gate_candidate": float(candidate)})
        with self.clock("learner"):
            metrics["randopt/update_rms"] = self.noise.apply_(step, coefs) if accepted else 0.0
        metrics["randopt/accepted"] = float(accepted)
        with self.clock("sync"):
            self.push_weights()
        return metrics

    def population_metrics(self, table: torch.Tensor, collected: list[Collected]) -> dict[str, Any]:
        """The rollout metrics averaged over the population (tokens summed), the spread of its mean
        rewards; and the curriculum sampler fed each prompt's reward averaged over the population."""
        keys = set.intersection(*(set(g.metrics) for g in collected))
        out: dict[str, Any] = {k: sum(float(g.metrics[k]) for g in collected) / len(collected) for k in keys
                               if all(isinstance(g.metrics[k], (int, float)) for g in collected)}
        for k in ("rollout/generated_tokens", "rollout/prompts_drawn"):
            out[k] = sum(float(g.metrics[k]) for g in collected)
        means = table.mean(1)
        out.update({"randopt/reward_best": float(means.max()), "randopt/reward_worst": float(means.min()),
                    "randopt/reward_spread": float(means.std(unbiased=False))})
        seen = [g.seen for g in collected]
        if all(s.rewards is not None and s.size == seen[0].size for s in seen):
            mean_rewards = torch.stack([s.rewards.float() for s in seen]).mean(0)
            self.sampler.update(collected[0].indices, mean_rewards, seen[0].group_ids)
        return out

    def title(self) -> str:
        return f"RandOpt ({self.cfg.randopt.consolidate.name})"
