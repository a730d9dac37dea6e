"""`python -m minitrain.worker`: started by a node agent, which writes the bootstrap line on stdin."""

from minitrain.worker.bootstrap import main

if __name__ == "__main__":
    main()
