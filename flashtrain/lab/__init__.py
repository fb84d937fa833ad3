"""The lab: tooling that runs and inspects the library (benchmarks, reports, compile checks)."""
