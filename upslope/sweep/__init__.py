"""`upslope sweep`: hyperparameter search over a recipe by successive halving, trials promoted by
resuming from their own checkpoints (JF-HPO's early stopping and checkpoint reuse, on a proxy model)."""
