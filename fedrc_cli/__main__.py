from fedrc_cli.app import main

main()
