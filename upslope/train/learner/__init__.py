"""Learner internals: the generic `Updater` (model, optimiser, micro-batching, precision,
checkpoint state, weight export) and the `Objective`s trainers pass to it."""
