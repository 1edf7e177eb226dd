"""`kvscale simulate`: the operator's control law against public traces, in simulated time."""
