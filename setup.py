"""The compiled part of the package: recording/_scan.c, the strict reader's hot loop. It is
optional: where no C compiler is at hand the build goes on without it and the reader uses its
pure-Python reading (the same results, slower; `kvoffload --version` says which is in use).
Everything else about the package is in pyproject.toml, whose `license` form needs setuptools
>= 77: pip's build uses it; for `python setup.py build_ext --inplace` the environment needs it
too (`make deps` installs it).
"""

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
