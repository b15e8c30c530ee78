import sys

from mink.cli.main import main

sys.exit(main())
