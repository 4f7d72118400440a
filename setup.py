"""The C part of seglog (everything else is in pyproject.toml).

The stream stamper's topic cache (``seglog.topics._topic_cache``) is optional: without a
compiler the build goes on and the stamper uses its NumPy cache (slower, same answers).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "seglog.topics._topic_cache",
            ["seglog/topics/_topic_cache.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
