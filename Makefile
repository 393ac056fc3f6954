# Two commands do all set-up on a fresh machine:
#   make demo   run DeiT-Small as a 2-stage pipeline on the shipped local cluster
#   make test   run the test suite
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps demo test lint bench

setup: $(STAMP)

# The SSH tests start Debian's openssh-server in network namespaces (root only;
# without root they skip with a loud reason, and fail under CI=true). The test
# hosts create venvs with Debian's python3, which needs python3-venv. The dashboard test drives tmux.
system-deps:
	@if [ "$$(id -u)" = 0 ] && { [ ! -x /usr/sbin/sshd ] || ! command -v ip >/dev/null || \
			! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || ! command -v tmux >/dev/null; }; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			openssh-server iproute2 python3 python3-venv tmux; fi

# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (as on
# this machine kind) every torch process would compile torch, timm and torchvision from source:
# importing timm took 13.6 s without, 4.7 s with.
$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "pictl needs Python >= 3.11"'
	$(PYTHON) -m pip install -q --disable-pip-version-check uv
	$(PYTHON) -m uv venv -q --allow-existing -p $(PYTHON) $(VENV)
	$(PYTHON) -m uv pip install -q --compile-bytecode -p $(VENV)/bin/python -e '.[remote,test,track,docs]'
	touch $@

demo: setup
	$(VENV)/bin/python -m compileall -q pictl remote >/dev/null
	$(VENV)/bin/pictl run --profile quick --headless

# Two workers (pytest-xdist): a module stays on one worker and the SSH cluster's tests on one (tests/conftest.py);
# each test then runs beside another, as on a lab's shared hosts (docs/tests.md).
# compileall: where PYTHONDONTWRITEBYTECODE is set (this machine kind), Python never writes pictl's own bytecode, so
# every `pictl` the tests start compiled all of pictl from source: 0.49 s to refuse a missing inventory, 0.37 s
# with the bytecode there (it is still read; a changed file is compiled again as usual).
test: setup system-deps
	$(VENV)/bin/python -m compileall -q pictl remote >/dev/null
	$(VENV)/bin/ruff check pictl remote tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir $(VENV)/site
	$(VENV)/bin/python -m pytest -q -rs -n 2 --dist loadgroup --durations=20

bench: setup
	$(VENV)/bin/python -m bench
