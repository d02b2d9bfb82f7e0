# Long-running checks that do not belong in CI (CI runs a 60 s soak in tests/reliability).
.PHONY: soak soak-twin soak-vllm
soak: soak-twin soak-vllm
soak-twin:
	.venv/bin/python benchmarks/soak.py --engine twin --minutes 30
soak-vllm:
	.venv/bin/python benchmarks/soak.py --engine vllm --minutes 10
