"""``python -m rmqstore.pipeline JOB ...``, and the script to give spark-submit::

    spark-submit --master spark://host:7077 "$(python -c 'import rmqstore.pipeline.__main__ as m; print(m.__file__)')" \
        reindex STORE --out OUT

The command line is ``rmqstore pipeline``'s (reindex, export, load, stats).
"""

from __future__ import annotations

import sys

from rmqstore.cli.pipeline_tools import main

if __name__ == "__main__":
    sys.exit(main())
