"""Algorithm plugins: advantages, policy losses, KL, filters, reward combiners; importing registers them."""
from upslope.algos import advantages, aggregate, combiners, correction, filters, kl, losses  # noqa: F401
from upslope.algos import distill  # noqa: F401  (distillation losses)
from upslope.algos import preference  # noqa: F401,E402  (preference losses for `upslope dpo`)
from upslope.algos import replay  # noqa: F401,E402  (rollout replay for the RL trainer)
from upslope.algos import exploration  # noqa: F401,E402  (exploration filters: darts)
from upslope.algos import terms, trust  # noqa: F401,E402  (RL loss terms; DCMDP's term, MIPU's update check)
