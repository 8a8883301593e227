import sys

from cotenant.cli import main

sys.exit(main())
