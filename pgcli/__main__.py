import sys

from pgcli.cli import main

sys.exit(main())
