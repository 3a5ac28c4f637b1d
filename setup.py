"""The compiled part of the package: recording/_scan.c, the journal reader's hot loop. It is
optional: where no C compiler is at hand the build goes on without it and the reader uses its
pure-Python twin (the same results, slower; `kvoffload analyze --help` says which is in use).
Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvoffload.recording._scan",
            ["exporter/kvoffload/recording/_scan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
