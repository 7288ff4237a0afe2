import sys

from elastic_dew.cli import main

sys.exit(main())
