# Two commands on a fresh machine: `make book` and `make test`. Both set up .venv first.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.install-stamp
NBBUILD := .nbbuild
LESSONS := $(wildcard lessons/*.md)
# pip prints a warning per package for local index folders it cannot use; keep the log readable.
PIPQUIET := { grep -v 'is ignored: it is neither a file nor a directory' || true; }

.PHONY: book test lint unit selfcheck lessons strict-book browser setup clean lab

setup: $(STAMP)

# torch first and pinned (the CPU wheel where one is at hand; on a normal Linux machine the same pin pulls
# the CUDA build from PyPI). SYSTEM_TORCH=1 uses the torch already installed instead (a GPU image's):
# the venv then sees the system's packages and no torch is installed into it.
SYSTEM_TORCH ?=
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(if $(SYSTEM_TORCH),--system-site-packages,) $(VENV)
ifeq ($(SYSTEM_TORCH),)
	$(PY) -m pip install -q torch==2.13.0 2>&1 | $(PIPQUIET)
else
	@$(PY) -c "import torch" 2>/dev/null || { echo "SYSTEM_TORCH=1, but $(PYTHON) has no torch: install torch for it, or drop SYSTEM_TORCH (and remove $(VENV))"; exit 1; }
	@$(PY) -c "import torch; print('using the installed torch', torch.__version__, 'CUDA', torch.version.cuda)"
endif
	grep -v '^torch==' requirements.txt > $(VENV)/requirements-without-torch.txt
	$(PY) -m pip install -q -r $(VENV)/requirements-without-torch.txt 2>&1 | $(PIPQUIET)
	$(PY) -m pip install -q --no-deps -e . 2>&1 | $(PIPQUIET)
	touch $(STAMP)

# JupyterLab (requirements-lab.txt), into the same .venv with its own stamp: building the book does not need
# it, `make lab` and the unit tests (tests/test_lab.py starts it) do. The main requirements constrain it, so
# it never moves a package the book was tested with. lab/overrides.json makes JupyterLab open Markdown
# (the lessons) with jupytext's notebook view.
LABSTAMP := $(VENV)/.lab-install-stamp
$(LABSTAMP): requirements-lab.txt lab/overrides.json $(STAMP)
	$(PY) -m pip install -q -r requirements-lab.txt -c $(VENV)/requirements-without-torch.txt 2>&1 | $(PIPQUIET)
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp lab/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $(LABSTAMP)

# The lessons as notebooks: double-click lessons/*.md. LAB_ARGS for a remote GPU machine, e.g.
# make lab LAB_ARGS="--no-browser --port 8888" (then an SSH tunnel to that port).
LAB_ARGS ?=
lab: $(LABSTAMP)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Sphinx rebuilds only pages whose source changed, so a change in course_lib would leave old outputs:
# every build starts from a clean _build and executes every page.
book: $(STAMP)
	rm -rf _build
	$(VENV)/bin/jupyter-book build . --keep-going
	@echo "The book: $(CURDIR)/_build/html/index.html"

test: lint unit selfcheck lessons strict-book browser

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools
	$(VENV)/bin/mypy src

unit: $(STAMP) $(LABSTAMP)
	$(PY) -m pytest tests/

# The self-check a reader runs first on a GPU, run here on the CPU: the same code paths, tiny.
selfcheck: $(STAMP)
	$(PY) -m course_lib.selfcheck --device cpu

# nbmake runs only .ipynb files and skips paths containing _build: convert into .nbbuild (ignored).
# --overwrite keeps the executed outputs, so strict-book need not execute the lessons a second time.
lessons: $(STAMP)
	rm -rf $(NBBUILD) && mkdir -p $(NBBUILD)/lessons
	for f in $(LESSONS); do \
	  $(VENV)/bin/jupytext --quiet --to ipynb "$$f" -o "$(NBBUILD)/lessons/$$(basename "$${f%.md}").ipynb"; \
	done
	$(PY) -m pytest --nbmake --nbmake-timeout=240 --overwrite -p no:cacheprovider $(NBBUILD)/lessons

# The book with warnings as errors, built from the lessons nbmake just executed (each lesson runs once in
# `make test`): a copy of the book's sources in .nbbuild/book with the executed notebooks in place of the
# Markdown lessons, and the lessons excluded from execution there (the other pages still execute).
# `make book` is the reader's build: it executes every page itself.
BOOKSTAGE := $(NBBUILD)/book
strict-book: lessons
	rm -rf _build $(BOOKSTAGE) && mkdir -p $(BOOKSTAGE)/lessons
	cp _config.yml _toc.yml $(BOOKSTAGE)/ && cp -r book $(BOOKSTAGE)/
	cp $(NBBUILD)/lessons/*.ipynb $(BOOKSTAGE)/lessons/
	$(PY) -c "import sys, yaml; c = yaml.safe_load(open('_config.yml')); \
	c['execute']['exclude_patterns'] = ['lessons/*.ipynb']; \
	yaml.safe_dump(c, open('$(BOOKSTAGE)/_config.yml', 'w'), sort_keys=False)"
	$(VENV)/bin/jupyter-book build $(BOOKSTAGE) -W -n --keep-going --path-output .
	@echo "The book: $(CURDIR)/_build/html/index.html"

# The built book in headless Chromium with the network blocked (tools/browser_check.py): every page of the
# toc loads with no console error, its images, math and widgets render; a screenshot per page in
# _build/screenshots. Without Chromium (Debian's package) it says SKIPPED; BROWSER_CHECK_REQUIRED=1 fails
# then instead (.ci/run sets it). On the book already built: make -o lessons -o strict-book browser
browser: strict-book
	$(PY) tools/browser_check.py _build/html --toc _toc.yml --screenshots _build/screenshots

clean:
	rm -rf _build $(NBBUILD) .pytest_cache
