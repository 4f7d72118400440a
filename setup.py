"""The C part of seglog (everything else is in pyproject.toml).

Both extensions are optional: without a compiler the build goes on and seglog uses its
Python paths (slower, same answers). The stream stamper's topic cache
(``seglog.topics._topic_cache``) falls back to a NumPy cache; ``Record`` conversion
(``seglog._columns``) to list comprehensions and ``pyarrow.array``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "seglog.topics._topic_cache",
            ["seglog/topics/_topic_cache.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            optional=True,
        ),
        Extension(
            "seglog._columns",
            ["seglog/_columns.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            optional=True,
        ),
    ]
)
