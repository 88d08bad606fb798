"""``python -m course_lib.distributed`` and ``torchrun -m course_lib.distributed``: one rank of a group."""

from .launch import main

raise SystemExit(main())
