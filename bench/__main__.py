from bench_llm.bench.cli import main

if __name__ == "__main__":
    main()
