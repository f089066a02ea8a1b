from experiments.validate.main import main

main()
