import sys

from loadpolicy.cli import main


sys.exit(main())
