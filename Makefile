# hpvc: `make demo` and `make test` do everything on a fresh Debian machine.
VENV := .venv
PY := $(VENV)/bin/python
HPVC := $(VENV)/bin/hpvc
SNAPSHOT := $(CURDIR)/tests/data/topologies/64amd64-4s2n4ca2co.tar.bz2

.PHONY: setup demo test lint unit bench clean slurm-up slurm-down

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

lint: setup
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy --strict src

# The unit tests are pure and independent: one pytest worker per CPU (xdist).
# The integration tests share the host (subnets, hugepages, the Slurm test
# cluster), so they run one at a time.
test: lint
	$(VENV)/bin/pytest -q -ra -n auto tests/unit
	$(VENV)/bin/pytest -q -ra --durations=25 tests/integration

unit: setup
	$(VENV)/bin/pytest -q -ra -n auto tests/unit

bench: setup
	$(HPVC) bench plan --out bench/results/plan
	$(HPVC) image build hpc
	$(HPVC) bench run --out bench/results/run
	$(HPVC) bench run --suite hpcc,startup --targets native,vm --out bench/results/run-vm
	$(HPVC) bench locality --out bench/results/locality
	$(HPVC) bench slurm --out bench/results/slurm
	$(HPVC) bench network --out bench/results/network
	$(HPVC) bench spark --out bench/results/spark
	$(HPVC) bench coordinator --out bench/results/coordinator
	$(HPVC) bench images --out bench/results/images

# Local Slurm test cluster (docs/slurm.md); the last line printed is the
# `export SLURM_CONF=...` to submit to it. HPVC_SLURM_DIR moves its state;
# HOSTS=N (1 to 32, default 3) sets how many hosts it has.
slurm-up: setup
	@$(MAKE) -s -C native/spank
	@bash scripts/slurm/install.sh >/dev/null
	@$(if $(HOSTS),HPVC_SLURM_HOSTS=$(HOSTS) )bash scripts/slurm/up.sh

slurm-down:
	@bash scripts/slurm/down.sh

clean:
	rm -rf build .mypy_cache .ruff_cache .pytest_cache .hypothesis
