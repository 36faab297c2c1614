#include "models/model_folder_info.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>

ModelFolderInfo DescribeModelFolder(const QString& dir) {
  ModelFolderInfo info;
  QFile config(QDir(dir).filePath("config.json"));
  if (!config.open(QIODevice::ReadOnly)) return info;
  info.exists = true;
  const QJsonObject c = QJsonDocument::fromJson(config.readAll()).object();
  const QJsonObject text = c.value("text_config").toObject();  // a multimodal checkpoint keeps the language model's here
  for (const QJsonObject& o : {c, text}) {
    if (info.modelType.isEmpty()) info.modelType = o.value("model_type").toString();
    for (const char* key : {"dtype", "torch_dtype"})
      if (info.dtype.isEmpty()) info.dtype = o.value(key).toString();
    const QJsonObject quant = o.value("quantization_config").toObject();
    if (quant.value("quant_method").toString() == "fp8") info.dtype = "fp8";
  }
  for (const QFileInfo& f : QDir(dir).entryInfoList({"*.safetensors"}, QDir::Files)) info.weightBytes += f.size();
  return info;
}
