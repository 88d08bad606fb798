import matplotlib
import pytest

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _no_size_override(monkeypatch):
    """Tests choose the size profile explicitly; an outer COURSE_SIZE must not leak in."""
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    yield


@pytest.fixture
def small_profile():
    from course_lib.device import SizeProfile

    return SizeProfile("small")
