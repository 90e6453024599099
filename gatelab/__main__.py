from gatelab.cli import main

main()
