"""Builds the optional compiled helpers; everything else is in pyproject.toml. Without Cython or
a C compiler the build still succeeds and Mink uses their pure-Python fallbacks:
- mink/protocol/_record_walk.pyx, the record walk (mink/protocol/record_walk.py gives the same
  results, slower);
- mink/storage/objectstore/_direct_read.pyx, direct reads into pooled memory without a copy
  (file.py copies out of a reused buffer instead);
- mink/storage/objectstore/_range_copy.pyx, compose's copy of ranges a step at a time without
  the GIL (file.py copies them in Python instead);
- mink/storage/objectstore/_create_file.pyx, a small object's create in one call without the
  GIL (file.py makes the same syscalls in Python instead)."""

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler: the pure-Python fallback serves
            print(f"warning: mink's compiled helpers were not built ({exc})")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: mink's compiled {ext.name} was not built ({exc})")


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("warning: Cython is missing: mink's compiled helpers are not built")
        return []
    return cythonize(["mink/protocol/_record_walk.pyx",
                      "mink/storage/objectstore/_direct_read.pyx",
                      "mink/storage/objectstore/_range_copy.pyx",
                      "mink/storage/objectstore/_create_file.pyx",
                      "mink/storage/lifecycle/_parent_watch.pyx"], quiet=True,
                     compiler_directives={"language_level": 3})


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
