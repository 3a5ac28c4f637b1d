from kvoffload.cli import main

main()
