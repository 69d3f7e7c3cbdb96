"""Method helpers a trainer builds on: the PPO critic, the distillation teacher, and preference-pair batches."""
