"""``python experiments/collect_summaries.py <table> <sweep dir>``: a sweep's runs as a paper table (see
:mod:`lab.collect_summaries`)."""

from lab.collect_summaries import main

if __name__ == "__main__":
    main()
