import sys

from preflight.app.cli import main

sys.exit(main())
