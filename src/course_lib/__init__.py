"""course_lib: the tested helper library behind *Mixed Precision, Measured*.

One module per idea a lesson teaches (``formats``, ...), plus shared ones (``device``, ``results``,
``models``, ``data``, ``plots``, ``widgets``). Experiments return small frozen dataclasses; plotting
functions take those and return matplotlib figures.
"""

__version__ = "0.1.0"
