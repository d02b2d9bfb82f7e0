"""Control: limits, the admission gate and the signals they read. Never imports engine internals."""
