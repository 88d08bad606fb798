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

.PHONY: book test lint unit selfcheck lessons strict-book browser setup clean lab gpu-wheels gpu-session

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
# every build starts from a clean _build and executes every page. The site's figures are then stored as
# palette PNGs where no pixel changes visibly (tools/compact_images.py): about a third of the bytes.
book: $(STAMP)
	rm -rf _build
	$(VENV)/bin/jupyter-book build . --keep-going
	$(PY) tools/compact_images.py _build/html/_images
	@echo "The book: $(CURDIR)/_build/html/index.html"

test: lint unit selfcheck lessons strict-book browser

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools
	$(VENV)/bin/mypy src

# One pytest-xdist worker per core, tests handed out as workers free up (worksteal: a few tests take 20 s).
unit: $(STAMP) $(LABSTAMP)
	$(PY) -m pytest -n auto --dist worksteal tests/

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
	$(PY) -m pytest --nbmake --nbmake-timeout=1200 --overwrite -p no:cacheprovider $(NBBUILD)/lessons

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
	$(PY) tools/compact_images.py _build/html/_images
	@echo "The book: $(CURDIR)/_build/html/index.html"

# The built book in headless Chromium with the network blocked (tools/browser_check.py): every page of the
# toc loads with no console error, its images, math and widgets render; a screenshot per page in
# _build/screenshots. Without Chromium (Debian's package) it says SKIPPED; BROWSER_CHECK_REQUIRED=1 fails
# then instead (.ci/run sets it). On the book already built: make -o lessons -o strict-book browser
browser: strict-book
	$(PY) tools/browser_check.py _build/html --toc _toc.yml --screenshots _build/screenshots

# A GPU machine: `make gpu-session` records the next parts of `python -m course_lib.gpu_session plan` (every
# registered experiment, then every lesson's wall time at the full profile) into results/; run it again, on
# this machine or a fresh one with the new records committed, until the plan says every part is done. On a
# GPU image with its own torch: make gpu-session SYSTEM_TORCH=1.
gpu-session: $(STAMP)
	$(PY) -m course_lib.gpu_session run --next

# An offline GPU machine with Python 3.12 and torch (no internet): `make gpu-wheels` here downloads into .whl/
# (ignored) the wheels the recording and the lessons need beyond such an image (torchao, and jupytext, nbclient,
# ipykernel and myst-nb with what they import; the image has torch, numpy, matplotlib, ml-dtypes, tensorboard).
# There, without a venv:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:src python3 -m course_lib.gpu_session run --next
GPU_WHEELS := torchao==0.18.0 myst-nb==1.4.0 docutils==0.21.2 jupytext==1.19.6 mdit-py-plugins==0.7.0 nbclient==0.11.0 \
  nbformat==5.11.1 fastjsonschema==2.22.3 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==2026.9.1 jupyter-client==8.10.0 jupyter-core==5.9.1 platformdirs==4.14.8 \
  pyzmq==27.3.0 tornado==6.6.1 traitlets==5.16.1 ipykernel==6.31.0 comm==0.2.3 debugpy==1.8.22 \
  matplotlib-inline==0.2.2 nest-asyncio==1.6.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 \
  parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3 \
  asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64
gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir -p .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(addprefix --platform ,$(GPU_PLATFORMS)) -d .whl $(GPU_WHEELS) 2>&1 | $(PIPQUIET)
	@du -sh .whl

clean:
	rm -rf _build $(NBBUILD) .pytest_cache
