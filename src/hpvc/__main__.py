from hpvc.cli import main

main()
