"""The quality gate's pure half: the probe suite (data, `suite`), the run of one model through it over a caller's
`ask` (`run`), and the comparison with a baseline (`compare`). No I/O but reading a suite file; docs/quality.md."""
