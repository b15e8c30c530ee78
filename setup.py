"""Builds the optional compiled record walk (mink/protocol/_record_walk.pyx); everything else
is in pyproject.toml. Without Cython or a C compiler the build still succeeds and Mink uses
the pure-Python walk (mink/protocol/record_walk.py), which gives the same results, slower."""

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler: the pure-Python fallback serves
            print(f"warning: mink's compiled record walk was not built ({exc})")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: mink's compiled record walk was not built ({exc})")


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("warning: Cython is missing: mink's compiled record walk is not built")
        return []
    return cythonize(["mink/protocol/_record_walk.pyx"], quiet=True,
                     compiler_directives={"language_level": 3})


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
