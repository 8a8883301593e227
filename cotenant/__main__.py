import sys

from cotenant.cli.main import main

sys.exit(main())
