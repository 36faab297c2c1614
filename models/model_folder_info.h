// What the model library shows of a folder without loading it: its weights' size on disk and
// dtype, and its architecture, from config.json and the *.safetensors files.
#pragma once

#include <QString>

struct ModelFolderInfo {
  bool exists = false;     // the folder holds a config.json
  qint64 weightBytes = 0;  // every *.safetensors file
  QString dtype;           // "bfloat16", "fp8", ... as config.json says; empty when it does not
  QString modelType;       // config.json's model_type
};

ModelFolderInfo DescribeModelFolder(const QString& dir);
