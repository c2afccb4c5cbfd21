from quartermaster_client.cli.main import main

main()
