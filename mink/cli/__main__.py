import sys

from mink.cli import main

sys.exit(main())
