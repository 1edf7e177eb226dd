"""Control laws: pure functions of (signal history, spec, state, now), run by the operator and,
unchanged, by the simulator. Nothing here does I/O."""
