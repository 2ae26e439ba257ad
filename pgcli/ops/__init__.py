"""Pure math for the on-policy family: advantages, losses, conjugate gradient, autodiff helpers, line search."""
