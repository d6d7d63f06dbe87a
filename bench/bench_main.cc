// ferry-bench: the benchmark program (`ferry bench` runs the same code).
namespace ferry::bench {
int Main(int argc, char** argv);
}

int main(int argc, char** argv) { return ferry::bench::Main(argc, argv); }
