# Two commands do all the set-up on a fresh machine:
#   make run   - create .venv, install, start the dashboard on http://localhost:8501
#   make test  - create .venv, install, lint and run the whole test suite
# and one redraws the README's picture (headless chromium, /usr/bin/chromium or ATTNSCOPE_CHROMIUM):
#   make screenshot - docs/images/attention.png and attention.json (what the picture shows, from the page)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 8501
ADDRESS ?= 127.0.0.1

.PHONY: setup run test lint typecheck bench clean screenshot

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .   # the `attnscope` command; `import attnscope` anywhere
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m attnscope run --address $(ADDRESS) --port $(PORT)

# mypy on attnscope.core and the modules that use the model interface. The repository's folders install
# as attnscope.core / .models / .dashboard, so mypy reads them through a link tree with that layout.
TYPED := -p attnscope.core -p attnscope.models.registry -p attnscope.models.pretrained \
	-p attnscope.dashboard.model_facts -p attnscope.dashboard.runs -p attnscope.cli -p attnscope.audit_cli

typecheck: setup
	rm -rf .typecheck && mkdir -p .typecheck/attnscope
	for f in attnscope/*.py; do ln -s ../../$$f .typecheck/attnscope/; done
	for d in core models dashboard; do ln -s ../../$$d .typecheck/attnscope/$$d; done
	cd .typecheck && $(abspath $(PY)) -m mypy --config-file ../pyproject.toml $(TYPED)

lint: setup typecheck
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2   # two workers (pytest-xdist): the tests are independent

screenshot: setup
	$(PY) -m bench.screenshot

clean:
	rm -rf $(VENV) artifacts .pytest_cache .ruff_cache .mypy_cache .typecheck
